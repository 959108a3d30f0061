"""The measurement lab: cases, providers, correctness checks, timing, ceilings and reports."""
