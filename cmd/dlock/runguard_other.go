//go:build unix && !linux

package main

// canAdoptOrphans: elsewhere the orphans of COMMAND's group go to init, so
// the guard cannot wait for them; it kills them when COMMAND exits, and
// --leftovers wait is refused.
const canAdoptOrphans = false

func adoptOrphans() {}

// groupEmpty cannot be known without adopting orphans.
func groupEmpty(int) bool { return false }
