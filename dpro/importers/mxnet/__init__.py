"""An MXNet recording of `dpro profile` (workers and parameter servers) -> gTrace."""
