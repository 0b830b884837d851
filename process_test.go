package dlock_test

const childRoleEnv = "DLOCK_TEST_CHILD"

func runChild(role string) int { return 2 }
