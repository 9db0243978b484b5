package python_test

import (
	"testing"

	"github.com/palrun/pal/paltest/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
