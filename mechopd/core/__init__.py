"""The foundation: errors, path and run checks, atomic artifacts, run locks, the two views, site names, seed statistics. Imports nothing else of mechopd."""
