"""Render: `video.render_video`, audio, schedule, encode and the renderers."""
