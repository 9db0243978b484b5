package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/palrun/pal/receipt"
)

// receiptStore opens PAL_RECEIPTS on first use and keeps it.
func (h *handler) receiptStore(r *http.Request) (*receipt.Store, error) {
	h.receiptsMu.Lock()
	defer h.receiptsMu.Unlock()
	if h.receipts != nil {
		return h.receipts, nil
	}
	rs, err := receipt.Open(r.Context(), h.cfg.Store.JetStream(), h.cfg.Store)
	if err != nil {
		return nil, err
	}
	h.receipts = rs
	return rs, nil
}

// codeReceiptInvalid: a stored receipt this server cannot vouch for: its
// signature does not verify against the server's keys, or it is another
// run's. It is not served.
const codeReceiptInvalid = "receipt_invalid"

// getReceipt answers GET /v1/runs/{id}/receipt: the stored receipt, only
// when its signature verifies against the server's keys (PAL_SIGNING_KEY,
// PAL_SIGNING_KEYS_OLD) and it is the run's; else 500 receipt_invalid
// naming why (503 when the server has no keys to check it with). 404
// names why there is none (no such run, or not ended or not yet signed).
func (h *handler) getReceipt(w http.ResponseWriter, r *http.Request) {
	id, err := pathRunID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	rs, err := h.receiptStore(r)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error(), "")
		return
	}
	rec, err := rs.Get(ctx, id)
	if errors.Is(err, receipt.ErrNotFound) {
		v, gerr := h.client.Get(ctx, id)
		if gerr != nil {
			h.fail(w, r, gerr)
			return
		}
		detail := fmt.Sprintf("run %s is %s: a receipt is signed when it ends", id, v.Status)
		if v.Status.Terminal() {
			detail = fmt.Sprintf("run %s has ended but is not signed yet: its worker signs at the end and the recovery sweep signs what a crash left (set PAL_SIGNING_KEY on the workers)", id)
		}
		writeError(w, http.StatusNotFound, "not_found", detail, "")
		return
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error(), "")
		return
	}
	keys := h.cfg.Keys.Public()
	if len(keys) == 0 {
		writeError(w, http.StatusServiceUnavailable, "unavailable",
			"this server has no signing keys to check the receipt against: set PAL_SIGNING_KEY (and PAL_SIGNING_KEYS_OLD for retired keys)", "")
		return
	}
	if err := receipt.VerifySignature(rec, keys); err != nil {
		h.log.Error("a stored receipt does not verify", "run_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, codeReceiptInvalid,
			fmt.Sprintf("the stored receipt of run %s is not PAL's: %v", id, err), "")
		return
	}
	if rec.RunID != id {
		h.log.Error("a stored receipt is another run's", "run_id", id, "receipt_run_id", clipText(rec.RunID, 64))
		writeError(w, http.StatusInternalServerError, codeReceiptInvalid,
			fmt.Sprintf("the receipt stored for run %s is another run's", id), "")
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// keysBody is GET /v1/keys.
type keysBody struct {
	Keys []receipt.KeyDoc `json:"keys"`
}

func (h *handler) listKeys(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, keysBody{Keys: h.cfg.Keys.Docs()})
}
