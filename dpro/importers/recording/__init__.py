"""A `dpro profile` recording directory (each rank's raw files, ``OUTPUT/raw``) -> one gTrace."""
