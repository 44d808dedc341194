"""Contracts: names that two sides of dpro must agree on (files, keys, environment variables)."""
