"""Translation jobs (stand-in for the jobs branch: on merge, its __init__.py wins)."""
