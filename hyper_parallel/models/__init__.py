"""Tiny deterministic models for the recipes: an MLP, a mini transformer and a mini MoE transformer."""
