package event

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// IdempotencyKey returns hex(sha256("runID|stepID|attempt")), the key every
// external call of a step attempt carries. A re-drive after a crash keeps
// the attempt, hence the key; only a journaled retry changes it.
func IdempotencyKey(runID, stepID string, attempt int) string {
	sum := sha256.Sum256([]byte(runID + "|" + stepID + "|" + strconv.Itoa(attempt)))
	return hex.EncodeToString(sum[:])
}
