"""The server layer: what toolhub changes in Daphne, Twisted and Django's ASGI handler.

- `asgi_handler`: Django's ASGI handler, with a request's synchronous work in one crossing
  to its thread.
- `limits`, `daphne_limits`: the request body limit, enforced as the bytes arrive.
- `daphne_frames`, `send_batches`: a text framed once for every socket, and sends that
  belong together written together.
- `draining`: a stopping server finishes its requests and refuses new ones.
- `startup`: what a long-running process does once it has started (freeze start-up objects).

`toolhub.asgi` installs these; the apps use only `draining` (to learn the server is
stopping) and `send_batches` (to mark sends that belong together). Nothing here imports
`apps`: `toolhub.asgi` imports `asgi_handler` before Django is set up. Tool modules never
import it (tests/test_architecture.py).
"""
