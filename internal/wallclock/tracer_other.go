//go:build !(linux && amd64)

package wallclock

import (
	"errors"
	"fmt"
	"runtime"
)

func supported() error {
	return fmt.Errorf("wallclock: a traced wall clock needs Linux on amd64, not %s/%s: %w", runtime.GOOS, runtime.GOARCH, errors.ErrUnsupported)
}
