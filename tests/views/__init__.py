"""Views built from events."""
