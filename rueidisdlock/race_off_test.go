//go:build !race

package rueidisdlock

const raceOn = false
