"""The watcher daemon: keeps the personas folder precompiled.

events     watchdog events -> immutable Change values; the name filter; the observer
settle     when a written file is ready to hash
reconcile  the folder against the store's `source` table
sources    that table's rows
jobs       the job queue (one job per avatar) and the spawned worker pool
worker     the worker process and its job function
health     pid lock, heartbeat, `hotplate status` lines
log        one line per decision, text or JSON
daemon     the loop tying them together; also `hotplate sync`'s one shot
"""
