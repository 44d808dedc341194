"""``python -m dpro``: the ``dpro`` command (:mod:`dpro.entry`)."""

from dpro.entry import main

if __name__ == "__main__":
    main()
