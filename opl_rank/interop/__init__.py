"""Conversions to and from other libraries' data formats."""
