"""The routers, one per resource; app.create_app includes each (see docs/notebook/serving.md)."""
