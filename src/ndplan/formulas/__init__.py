"""Pure formula builders: each returns SymPy expressions or Terms, never prints."""
