"""Analyses over loaded recordings. `varmri` holds the pure statistics; `pipeline` runs them."""
