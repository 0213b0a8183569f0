"""Honest-server attacks in closed form: fc_analytic, spear (spear_core), tensor, cpa."""
