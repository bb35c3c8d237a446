"""Robot drivers, registered by URI scheme in ``embodied.core.registry.ROBOTS`` on import."""

from embodied.hardware.drivers import crazyflie, mavlink, serial_link, sim  # noqa: F401
