"""Messages every process shares, as bytes."""
