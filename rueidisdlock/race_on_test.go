//go:build race

package rueidisdlock

// raceOn: the race detector's instrumentation allocates on its own, so
// allocation counts are checked without it.
const raceOn = true
