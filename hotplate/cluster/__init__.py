"""hotplate on a Ray cluster: the app as a Ray Serve deployment (serve.py) and the fleet
precompile as Ray tasks (sync.py). Ray itself is imported only inside their functions."""
