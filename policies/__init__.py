"""Pure policy functions and their file formats: window policies (fixed, threshold,
cost-aware scheduler), cost tables, STS calibration and the rollout policy file.

Nothing here holds state or does I/O beyond loading and saving its own files.
"""
