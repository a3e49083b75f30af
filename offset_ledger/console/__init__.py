"""The web console: HTML shells and static files served by ``offset-ledger serve`` at ``/``.

Pages carry no ledger data; their scripts read the JSON API with the bearer token the operator
typed in (kept in sessionStorage), so the console never widens what a token-less caller can see.
"""

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "pages", "reads"
})
