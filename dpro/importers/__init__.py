"""Importers that turn other tools' traces into gTrace."""
