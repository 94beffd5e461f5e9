"""Local stand-ins for what Azure provides: the `retrain` front-door commands (cli.py), a folder or
container watch that plays Event Grid (watch.py), and a loopback Event Grid topic (topic.py). None of it is
deployed: .funcignore leaves this folder out, and nothing the Function App imports imports it
(tests/test_architecture.py).
"""
