package dlock

// ObservedMessages returns how many election messages the Observe
// goroutines of c have applied: tests wait for it rather than for a while.
func ObservedMessages(c *Client) uint64 { return c.observers.applied.Load() }
