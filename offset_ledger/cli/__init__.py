"""The command line face (``offset-ledger``) and the demo. Nothing outside the faces imports it."""
