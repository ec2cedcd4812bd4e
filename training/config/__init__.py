"""The run's config: its sections, each key a setting with its help, resume rule and check (sections.py),
and reading it from YAML and the command line (reading.py)."""
