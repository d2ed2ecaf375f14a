"""One Roost broker: sans-IO core and trio shell."""
