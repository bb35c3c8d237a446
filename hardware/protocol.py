"""The serial link's framed binary protocol (host <-> the firmware program generated beside the policy):

    0xAA 0x55 | len (u8, payload bytes) | msg (u8) | seq (u8) | payload | crc16 (u16 LE)

CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection) over ``len, msg, seq, payload``.
Payload floats are little-endian float32. A reply carries the sequence number of the request it answers (the
host discards late replies to earlier requests). The same constants are written into ``firmware.c``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SYNC = b"\xaa\x55"
MAX_PAYLOAD = 255
HEADER = 5  # sync (2), len, msg, seq
OVERHEAD = HEADER + 2

STATE = 0x01  # host -> firmware: the robot terms of the policy observation, float32 each
ACTION = 0x02  # firmware -> host: the action, float32 each
RESET = 0x03  # host -> firmware: reset the action history (new episode); answered by ACK
HEARTBEAT = 0x04  # host -> firmware: answered by a HEARTBEAT with status u8, frames u32, crc errors u32
ACK = 0x05  # firmware -> host: payload u8, the acknowledged msg
ESTOP = 0x06  # host -> firmware: latch the e-stop (answers STATE with the motors-off action); ACK
CLEAR_ESTOP = 0x07  # host -> firmware: clear the e-stop latch; ACK
MESSAGES = {STATE: "STATE", ACTION: "ACTION", RESET: "RESET", HEARTBEAT: "HEARTBEAT", ACK: "ACK", ESTOP: "ESTOP",
            CLEAR_ESTOP: "CLEAR_ESTOP"}


def crc16(data: bytes, crc: int = 0xFFFF) -> int:
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def encode(msg: int, seq: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    body = bytes((len(payload), msg & 0xFF, seq & 0xFF)) + payload
    return SYNC + body + struct.pack("<H", crc16(body))


def floats(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *(float(v) for v in values))


def unpack_floats(payload: bytes) -> tuple[float, ...]:
    return struct.unpack(f"<{len(payload) // 4}f", payload[: len(payload) // 4 * 4])


@dataclass
class Frame:
    msg: int
    seq: int
    payload: bytes


class Decoder:
    """Byte-stream parser: ``feed(bytes) -> [Frame]``. Resynchronizes on the sync word after any bad frame;
    counts CRC failures. Never raises on input and keeps at most one frame's bytes."""

    def __init__(self):
        self.buf = bytearray()
        self.crc_errors = 0
        self.frames = 0

    def feed(self, data: bytes) -> list[Frame]:
        self.buf += data
        out = []
        while True:
            start = self.buf.find(SYNC)
            if start < 0:  # keep a trailing 0xAA: it may begin the next sync word
                del self.buf[: max(0, len(self.buf) - 1)]
                return out
            del self.buf[:start]
            if len(self.buf) < HEADER:
                return out
            n = self.buf[2]
            if len(self.buf) < OVERHEAD + n:
                return out
            body = bytes(self.buf[2: HEADER + n])
            (crc,) = struct.unpack_from("<H", self.buf, HEADER + n)
            if crc != crc16(body):
                self.crc_errors += 1
                del self.buf[:1]  # skip this sync word, look for the next
                continue
            del self.buf[: OVERHEAD + n]
            self.frames += 1
            out.append(Frame(body[1], body[2], body[3:]))
