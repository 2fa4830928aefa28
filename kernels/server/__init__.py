"""The replay-server device kind: `server:tcp://HOST:PORT` runs a Plan's replay tasks on a
`pearl replay-server` (pearl/server) through a ReplayClient (backend.py)."""
