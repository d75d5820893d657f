"""`hotplate serve`: the lip-sync route over HTTP, a job queue on render workers, a page.

Modules: app.py (routes), jobs.py (records in SQLite, the queue), workers.py (render
processes that keep models loaded), metrics.py (Prometheus text), problems.py (RFC 9457
errors), uploads.py (size and audio checks), static/ (the page).
"""
