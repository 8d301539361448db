"""Leaseboard's pure core: data model, store protocols, strategies, coordinator. No Django here."""
