"""Recipes M1-M7, S1-S3 and tiers A/B/C: degrees, model, parallelize order and the reference check.

``registry`` is torch-free metadata; ``training`` runs a workload against its single-process
reference inside a worker; the other modules build workloads per family.
"""

from hyper_parallel.recipes.registry import RECIPES, Recipe, get

__all__ = ["RECIPES", "Recipe", "get"]
