"""The web dashboard (FastAPI + Jinja2 + htmx)."""
