package wire

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot is Redis Cluster's hash slot of key: CRC16 (XMODEM) of the key, or
// of its hash tag (the part between the first '{' and the next '}', if not
// empty), mod Slots. Every key of a lock has the lock's name as its tag.
func Slot(key string) uint16 {
	if tag, ok := HashTag(key); ok {
		key = tag
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % Slots
}
