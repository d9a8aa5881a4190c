"""The live page: the proxy's exchanges classified as they are written, by the analyzer's own
per-record code in a process of its own, and shown per run at /_toolproxy/.

view is the proxy's side (the recorded hook feeds it; the page's routes ask it); classifier is the
process that classifies and tallies; turns derives each run's turns, episodes and roles as the
report does; page.html is the page. It knows records and the analyzer, not the proxy:
proxy/addons.py hangs it on the recorded hook and proxy/admin.py answers its routes.
"""
