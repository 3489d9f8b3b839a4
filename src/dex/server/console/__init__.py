"""The web console at ``/ui``, served by ``dex server`` itself: server-rendered pages (Jinja2)
for a person to see what waits for them, read sessions and the cluster, and act.

``routes`` holds the pages and actions, ``pages`` the rendering (kept apart so the auth
layer and the error handlers can render a page without importing the routes), and the
package data (``templates/``, ``static/``) ships in the wheel. See docs/console.md.
"""
