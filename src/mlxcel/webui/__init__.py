"""The browser playground's static files (HTML, CSS, ES modules), served by api/routes/webui.py."""
