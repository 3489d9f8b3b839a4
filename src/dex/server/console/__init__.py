"""The web console at ``/ui``, served by ``dex server`` itself: server-rendered pages (Jinja2)
for a person to see what waits for them, read sessions and the cluster, and act.

``routes`` holds the pages and actions, ``conversation`` the conversation a session page
shows, and the package data (``templates/``, ``static/``) ships in the wheel. The rendering
is ``dex.server.pages``, below the API, so that the auth layer and the error handlers can
render a page without importing the console. See docs/console.md.
"""
