package wire

import "testing"

// TestSlot checks Slot against the slots Redis Cluster documents and
// computes (CLUSTER KEYSLOT): the CRC16 check value, a plain key, and keys
// whose hash tag decides.
func TestSlot(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789":            0x31C3 % Slots, // the XMODEM check value 0x31C3
		"foo":                  12182,
		"{foo}.bar":            12182,
		"dlock:{foo}":          12182,
		"dlock:{foo}:q":        12182,
		"{}foo":                Slot("{}foo"), // an empty tag: the whole key
		"user{}":               Slot("user{}"),
		"{user1000}.following": Slot("user1000"),
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	if Slot("{}foo") == Slot("foo") {
		t.Error(`Slot("{}foo") hashed only "foo": an empty tag must not count`)
	}
}
