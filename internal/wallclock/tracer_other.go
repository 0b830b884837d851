//go:build !(linux && amd64)

package wallclock

import "runtime"

func supported() error {
	return errUnsupported("a traced wall clock needs Linux on amd64, not " + runtime.GOOS + "/" + runtime.GOARCH)
}
