"""Sweep reports: collect a sweep (run directories or wandb runs), write runs.csv, report.md, report.html and figures."""
