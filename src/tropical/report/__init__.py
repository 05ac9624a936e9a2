"""Human-facing output: tables now, plots and markdown reports for experiments."""
