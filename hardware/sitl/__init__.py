"""Software-in-the-loop vehicles: our simulator behind a real autopilot protocol (MAVLink; CRTP for cflib)."""
