"""Django's SQLite backend, with writers of one process taking turns (see base.py)."""
