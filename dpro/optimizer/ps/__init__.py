"""Parameter-server jobs (MXNet kvstore ``dist_*`` over ps-lite): where each gradient's
pieces go (:mod:`.layout`), what a server costs (:mod:`.costs`), and the one setting that
moves them, searched exhaustively (:mod:`.bound_search`)."""
