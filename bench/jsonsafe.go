package main

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"sort"
	"strings"
)

// marshalIndent is json.MarshalIndent that writes NaN and ±Inf as null
// (a figure that could not be measured, e.g. a median of nothing) instead of
// failing. It follows json tags (name, "-", omitempty) of exported fields.
func marshalIndent(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := encodeSafe(&b, reflect.ValueOf(v)); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func encodeSafe(b *bytes.Buffer, v reflect.Value) error {
	switch v.Kind() {
	case reflect.Invalid:
		b.WriteString("null")
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			b.WriteString("null")
			return nil
		}
		return encodePlain(b, f)
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			b.WriteString("null")
			return nil
		}
		return encodeSafe(b, v.Elem())
	case reflect.Struct:
		b.WriteByte('{')
		first := true
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fv := v.Field(i)
			if strings.Contains(opts, "omitempty") && isEmpty(fv) {
				continue
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			if err := encodePlain(b, name); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := encodeSafe(b, fv); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			b.WriteString("null")
			return nil
		}
		b.WriteByte('[')
		for i := range v.Len() {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeSafe(b, v.Index(i)); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case reflect.Map:
		if v.IsNil() {
			b.WriteString("null")
			return nil
		}
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodePlain(b, k.String()); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := encodeSafe(b, v.MapIndex(k)); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return encodePlain(b, v.Interface())
	}
	return nil
}

func encodePlain(b *bytes.Buffer, v any) error {
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b.Write(j)
	return nil
}

func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Slice, reflect.Map, reflect.String, reflect.Array:
		return v.Len() == 0
	default:
		return v.IsZero()
	}
}
