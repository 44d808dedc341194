"""The graph passes `dpro optimize` searches with (the interface: :mod:`.base`; which ones a
run uses: :mod:`.registry`). Users write passes against the public facade, :mod:`dpro.passes`."""
