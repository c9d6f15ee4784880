// helm_render renders a Helm chart's templates the way `helm template` does, for the checks in
// scripts/render-chart.sh on machines where helm itself is not installable. It is Go's
// text/template with sprig's functions plus the ones Helm adds (include, tpl, required, toYaml,
// fromYaml, toJson, lookup), and the objects a template sees: .Values (values.yaml deep-merged
// with every -f file, then --set), .Release, .Chart, .Capabilities and .Template.
//
//	helm_render [-f values.yaml]... [--set a.b=c]... [--release NAME] [--namespace NS]
//	            [--dump-values FILE] CHART_DIR
//
// Output: every non-empty rendered template, each document led by "# Source: <chart>/<path>",
// separated by "---", on stdout. NOTES.txt and partials (files starting with "_") are not emitted.
// --dump-values writes the merged values as JSON (for values.schema.json checks).
//
// Numbers in values are float64, as in Helm (--set integers stay int64, as in Helm).
//
// Not Helm: no subcharts or dependencies, no hooks, no lookup against a cluster (lookup returns an
// empty map), --set takes only scalar values (true/false/null/integers are typed, the rest are
// strings), and the file ordering is by path rather than by kind.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"gopkg.in/yaml.v3"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// Capabilities is .Capabilities: the Kubernetes version and API groups the chart may assume.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions APIVersions
}

type KubeVersion struct {
	Version, Major, Minor, GitVersion string
}

func (k KubeVersion) String() string { return k.Version }

// APIVersions supports `.Capabilities.APIVersions.Has "monitoring.coreos.com/v1"` (group/version
// or group/version/Kind).
type APIVersions []string

func (a APIVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

var defaultAPIVersions = []string{
	"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v1", "autoscaling/v2",
	"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1",
	"node.k8s.io/v1", "scheduling.k8s.io/v1", "coordination.k8s.io/v1",
	"apiextensions.k8s.io/v1", "admissionregistration.k8s.io/v1", "discovery.k8s.io/v1",
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "helm_render: "+format+"\n", args...)
	os.Exit(1)
}

func readYAMLMap(path string) map[string]interface{} {
	data, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		fail("%s: %v", path, err)
	}
	if m == nil {
		m = map[string]interface{}{}
	}
	return m
}

// mergeValues merges src into dst as Helm merges -f files: maps merge key by key, anything else
// replaces, and a null removes the key.
func mergeValues(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			dst[k] = mergeValues(dm, sm)
		} else {
			dst[k] = v
		}
	}
	return dst
}

func parseSetValue(s string) interface{} {
	switch s {
	case "true":
		return true
	case "false":
		return false
	case "null":
		return nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i
	}
	return s
}

func applySet(values map[string]interface{}, expr string) {
	eq := strings.IndexByte(expr, '=')
	if eq <= 0 {
		fail("--set %q: want key=value", expr)
	}
	keys := strings.Split(expr[:eq], ".")
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	v := parseSetValue(expr[eq+1:])
	if v == nil {
		delete(m, keys[len(keys)-1])
	} else {
		m[keys[len(keys)-1]] = v
	}
}

// helmNumbers makes every number of a values tree a float64, as Helm's values are (it decodes
// them through JSON): `{{ .Values.n }}` then prints 2000000 as "2e+06" here too, and the checks
// catch a template that prints a large number without toYaml or int.
func helmNumbers(v interface{}) interface{} {
	switch x := v.(type) {
	case map[string]interface{}:
		for k, e := range x {
			x[k] = helmNumbers(e)
		}
	case []interface{}:
		for i, e := range x {
			x[i] = helmNumbers(e)
		}
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	}
	return v
}

// jsonNumbers copies v with whole float64s as int64s, so toYaml writes numbers as Helm's
// JSON-based YAML encoder does (1048576, not 1.048576e+06).
func jsonNumbers(v interface{}) interface{} {
	switch x := v.(type) {
	case map[string]interface{}:
		out := make(map[string]interface{}, len(x))
		for k, e := range x {
			out[k] = jsonNumbers(e)
		}
		return out
	case []interface{}:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = jsonNumbers(e)
		}
		return out
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1e21 {
			return int64(x)
		}
	}
	return v
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(jsonNumbers(v)); err != nil {
		return ""
	}
	enc.Close()
	return strings.TrimSuffix(buf.String(), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	b, err := json.Marshal(jsonable(v))
	if err != nil {
		return ""
	}
	return string(b)
}

// jsonable converts yaml.v3's map[interface{}]interface{} leftovers (none expected from Unmarshal
// into map[string]interface{}, but nested maps of fromYaml may hold them) into string-keyed maps.
func jsonable(v interface{}) interface{} {
	switch x := v.(type) {
	case map[string]interface{}:
		out := map[string]interface{}{}
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case map[interface{}]interface{}:
		out := map[string]interface{}{}
		for k, e := range x {
			out[fmt.Sprint(k)] = jsonable(e)
		}
		return out
	case []interface{}:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	}
	return v
}

type renderer struct {
	root  *template.Template
	funcs template.FuncMap
}

func (r *renderer) include(name string, data interface{}) (string, error) {
	var buf bytes.Buffer
	if err := r.root.ExecuteTemplate(&buf, name, data); err != nil {
		return "", err
	}
	return buf.String(), nil
}

func (r *renderer) tpl(text string, data interface{}) (string, error) {
	t, err := r.root.Clone()
	if err != nil {
		return "", err
	}
	t, err = t.New("tpl").Parse(text)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return "", err
	}
	return buf.String(), nil
}

func required(msg string, v interface{}) (interface{}, error) {
	if v == nil {
		return nil, fmt.Errorf("%s", msg)
	}
	if s, ok := v.(string); ok && s == "" {
		return nil, fmt.Errorf("%s", msg)
	}
	return v, nil
}

func main() {
	var valueFiles, sets stringList
	release, namespace, dumpValues, kubeVersion := "icecache", "default", "", "1.31.0"
	var chartDir string
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() string {
			if i+1 >= len(args) {
				fail("%s needs a value", a)
			}
			i++
			return args[i]
		}
		switch a {
		case "-f", "--values":
			valueFiles.Set(next())
		case "--set":
			sets.Set(next())
		case "--release":
			release = next()
		case "--namespace", "-n":
			namespace = next()
		case "--dump-values":
			dumpValues = next()
		case "--kube-version":
			kubeVersion = strings.TrimPrefix(next(), "v")
		default:
			if strings.HasPrefix(a, "-") || chartDir != "" {
				fail("usage: helm_render [-f values.yaml]... [--set k=v]... [--release NAME] [--namespace NS] [--kube-version 1.31.0] [--dump-values FILE] CHART_DIR")
			}
			chartDir = a
		}
	}
	if chartDir == "" {
		fail("no chart directory")
	}

	chartMeta := readYAMLMap(filepath.Join(chartDir, "Chart.yaml"))
	chart := map[string]interface{}{}
	for k, v := range chartMeta {
		// Helm exposes Chart.yaml's keys capitalised (.Chart.Name, .Chart.AppVersion).
		chart[strings.ToUpper(k[:1])+k[1:]] = v
	}
	chartName := fmt.Sprint(chart["Name"])

	values := readYAMLMap(filepath.Join(chartDir, "values.yaml"))
	for _, f := range valueFiles {
		values = mergeValues(values, readYAMLMap(f))
	}
	values = helmNumbers(values).(map[string]interface{})
	for _, s := range sets {
		applySet(values, s)
	}
	if dumpValues != "" {
		b, err := json.MarshalIndent(jsonable(values), "", "  ")
		if err != nil {
			fail("values: %v", err)
		}
		if err := os.WriteFile(dumpValues, b, 0o644); err != nil {
			fail("%v", err)
		}
	}

	parts := strings.SplitN(kubeVersion, ".", 3)
	if len(parts) < 2 {
		fail("--kube-version %q: want MAJOR.MINOR[.PATCH]", kubeVersion)
	}
	caps := Capabilities{
		KubeVersion: KubeVersion{Version: "v" + kubeVersion, Major: parts[0], Minor: parts[1], GitVersion: "v" + kubeVersion},
		APIVersions: APIVersions(defaultAPIVersions),
	}

	r := &renderer{}
	r.funcs = sprig.TxtFuncMap()
	r.funcs["include"] = r.include
	r.funcs["tpl"] = r.tpl
	r.funcs["required"] = required
	r.funcs["toYaml"] = toYAML
	r.funcs["fromYaml"] = fromYAML
	r.funcs["toJson"] = toJSON
	r.funcs["lookup"] = func(...interface{}) map[string]interface{} { return map[string]interface{}{} }
	r.root = template.New("root").Funcs(r.funcs).Option("missingkey=zero")

	templatesDir := filepath.Join(chartDir, "templates")
	var files []string
	err := filepath.Walk(templatesDir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !info.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		fail("%v", err)
	}
	sort.Strings(files)
	names := map[string]string{} // template name -> file
	for _, p := range files {
		rel, _ := filepath.Rel(chartDir, p)
		name := chartName + "/" + filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			fail("%v", err)
		}
		if _, err := r.root.New(name).Parse(string(data)); err != nil {
			fail("%v", err)
		}
		names[name] = p
	}

	var out bytes.Buffer
	for _, p := range files {
		rel, _ := filepath.Rel(chartDir, p)
		base := filepath.Base(p)
		if strings.HasPrefix(base, "_") || strings.EqualFold(base, "NOTES.txt") {
			continue
		}
		name := chartName + "/" + filepath.ToSlash(rel)
		data := map[string]interface{}{
			"Values": values,
			"Chart":  chart,
			"Release": map[string]interface{}{
				"Name": release, "Namespace": namespace, "Service": "Helm",
				"IsInstall": true, "IsUpgrade": false, "Revision": 1,
			},
			"Capabilities": caps,
			"Template":     map[string]interface{}{"Name": name, "BasePath": chartName + "/templates"},
			"Files":        map[string]interface{}{},
		}
		var buf bytes.Buffer
		if err := r.root.ExecuteTemplate(&buf, name, data); err != nil {
			fail("%v", err)
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		for _, doc := range splitDocuments(text) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.Trim(doc, "\n"))
		}
	}
	os.Stdout.Write(out.Bytes())
}

// splitDocuments splits a rendered file at lines that are exactly "---".
func splitDocuments(text string) []string {
	var docs []string
	var cur []string
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimRight(line, " \t") == "---" {
			docs = append(docs, strings.Join(cur, "\n"))
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return append(docs, strings.Join(cur, "\n"))
}

func stripComments(doc string) string {
	var keep []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
