//! What the dashboards name, and what the code emitted, read as plain
//! data: Prometheus's text exposition, the metric names and label matchers
//! of a PromQL expression, CloudWatch's Embedded Metric Format lines, and
//! the metrics a CloudWatch dashboard's widgets read.
//!
//! The PromQL reader is no PromQL parser: it takes every identifier that
//! starts with `idempotency_` as a metric name (the crate's names all do,
//! and no function, keyword or label of the dashboards does), the
//! `label op "value"` matchers in the braces right after one, and the
//! labels of every `by (…)` and `without (…)`. The CloudWatch reader takes
//! the metric rows of each widget (`[namespace, name, dimension, value, …]`,
//! with `...` and `.` for the row before's) and the `SEARCH('{namespace,
//! dimension, …} Name="value" …')` calls of its expressions.

use std::collections::{BTreeMap, BTreeSet};

/// A Prometheus text exposition: each family's `# TYPE`, and each sample
/// name's series (their labels).
#[derive(Debug, Default)]
pub struct Exposition {
    pub types: BTreeMap<String, String>,
    pub series: BTreeMap<String, Vec<BTreeMap<String, String>>>,
}

impl Exposition {
    pub fn parse(text: &str) -> Self {
        let mut exposition = Exposition::default();
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            if let Some(declared) = line.strip_prefix("# TYPE ") {
                let (family, kind) = declared.split_once(' ').expect("# TYPE name kind");
                exposition.types.insert(family.into(), kind.into());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (name, labels) = match line.split_once('{') {
                Some((name, rest)) => {
                    let (labels, _) = rest.rsplit_once('}').expect("labels closed");
                    (name, matchers(labels))
                }
                None => (line.split_whitespace().next().unwrap_or(line), Vec::new()),
            };
            let labels = labels
                .into_iter()
                .map(|matcher| (matcher.label, matcher.value))
                .collect();
            exposition
                .series
                .entry(name.into())
                .or_default()
                .push(labels);
        }
        exposition
    }

    /// The values `label` takes on the series named `name`.
    pub fn values(&self, name: &str, label: &str) -> BTreeSet<&str> {
        self.series
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|labels| labels.get(label).map(String::as_str))
            .collect()
    }

    /// The family a sample name belongs to, with its type: a histogram's
    /// `_bucket`, `_sum` and `_count` samples are its family's.
    pub fn family(&self, sample: &str) -> Option<(&str, &str)> {
        self.types
            .iter()
            .find(|(family, kind)| {
                *family == sample
                    || (kind.as_str() == "histogram" || kind.as_str() == "summary")
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| sample.strip_suffix(suffix) == Some(family.as_str()))
            })
            .map(|(family, kind)| (family.as_str(), kind.as_str()))
    }
}

/// One `label op "value"` matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub label: String,
    pub op: String,
    pub value: String,
}

/// The matchers of a selector's braces (without the braces).
fn matchers(text: &str) -> Vec<Matcher> {
    let mut found = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        let Some(op_at) = rest.find(['=', '!']) else {
            return found;
        };
        let label = rest[..op_at].trim().to_owned();
        let after = &rest[op_at..];
        let op_len =
            if after.starts_with("=~") || after.starts_with("!=") || after.starts_with("!~") {
                2
            } else {
                1
            };
        let op = after[..op_len].to_owned();
        let quoted = after[op_len..].trim_start();
        let quoted = quoted.strip_prefix('"').expect("a quoted value");
        let end = quoted.find('"').expect("the value's closing quote");
        found.push(Matcher {
            label,
            op,
            value: quoted[..end].to_owned(),
        });
        rest = &quoted[end + 1..];
    }
}

/// What a PromQL expression reads.
#[derive(Debug, Default)]
pub struct PromQl {
    /// The metric names, each with the matchers of its selector.
    pub selectors: Vec<(String, Vec<Matcher>)>,
    /// The labels of its `by (…)` and `without (…)` clauses.
    pub grouping: BTreeSet<String>,
}

fn is_identifier(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

impl PromQl {
    pub fn parse(expr: &str) -> Self {
        let mut read = PromQl::default();
        let mut at = 0;
        while let Some(found) = expr[at..].find("idempotency_") {
            let start = at + found;
            let starts_identifier = !expr[..start].ends_with(is_identifier);
            let end = expr[start..]
                .find(|c: char| !is_identifier(c))
                .map_or(expr.len(), |len| start + len);
            at = end;
            if !starts_identifier {
                continue;
            }
            let name = expr[start..end].to_owned();
            let matchers = match expr[end..].strip_prefix('{') {
                Some(braced) => matchers(&braced[..braced.find('}').expect("selector closed")]),
                None => Vec::new(),
            };
            read.selectors.push((name, matchers));
        }
        for clause in ["by", "without"] {
            let mut at = 0;
            while let Some(found) = expr[at..].find(clause) {
                let start = at + found;
                at = start + clause.len();
                let standalone = !expr[..start].ends_with(is_identifier)
                    && !expr[at..].starts_with(is_identifier);
                let Some(list) = expr[at..].trim_start().strip_prefix('(') else {
                    continue;
                };
                if standalone {
                    let list = &list[..list.find(')').expect("grouping closed")];
                    read.grouping.extend(
                        list.split(',')
                            .map(str::trim)
                            .filter(|label| !label.is_empty())
                            .map(str::to_owned),
                    );
                }
            }
        }
        read
    }
}

/// A CloudWatch metric's identity: namespace, name, and its dimensions'
/// names (a metric with another dimension set is another metric).
pub type CloudWatchMetric = (String, String, BTreeSet<String>);

/// What EMF lines declared: each metric, and each dimension's values.
#[derive(Debug, Default)]
pub struct EmfEmitted {
    pub metrics: BTreeSet<CloudWatchMetric>,
    pub values: BTreeMap<String, BTreeSet<String>>,
}

impl EmfEmitted {
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Self {
        let mut emitted = EmfEmitted::default();
        for line in lines {
            let line: serde_json::Value = serde_json::from_str(line).expect("an EMF line");
            for declared in line["_aws"]["CloudWatchMetrics"]
                .as_array()
                .expect("declared")
            {
                let namespace = declared["Namespace"].as_str().expect("a namespace");
                for dimensions in declared["Dimensions"].as_array().expect("dimension sets") {
                    let dimensions: BTreeSet<String> = dimensions
                        .as_array()
                        .expect("a dimension set")
                        .iter()
                        .map(|name| name.as_str().expect("a dimension name").to_owned())
                        .collect();
                    for dimension in &dimensions {
                        let value = line[dimension].as_str().expect("a dimension's value");
                        emitted
                            .values
                            .entry(dimension.clone())
                            .or_default()
                            .insert(value.to_owned());
                    }
                    for metric in declared["Metrics"].as_array().expect("metrics") {
                        let name = metric["Name"].as_str().expect("a metric name");
                        emitted.metrics.insert((
                            namespace.to_owned(),
                            name.to_owned(),
                            dimensions.clone(),
                        ));
                    }
                }
            }
        }
        emitted
    }
}

/// A metric a widget reads, with the dimension values it asks for.
#[derive(Debug)]
pub struct WidgetMetric {
    pub metric: CloudWatchMetric,
    pub filters: BTreeMap<String, BTreeSet<String>>,
}

/// The metrics the widgets of a CloudWatch dashboard body read.
pub fn widget_metrics(body: &serde_json::Value) -> Vec<(String, WidgetMetric)> {
    let mut read = Vec::new();
    for widget in body["widgets"].as_array().expect("widgets") {
        if widget["type"] != "metric" {
            continue;
        }
        let title = widget["properties"]["title"]
            .as_str()
            .expect("a title")
            .to_owned();
        let mut before: Vec<serde_json::Value> = Vec::new();
        for row in widget["properties"]["metrics"].as_array().expect("metrics") {
            let row = row.as_array().expect("a metric row");
            if let Some(expression) = row.first().and_then(|first| first["expression"].as_str()) {
                read.extend(searches(expression).into_iter().map(|m| (title.clone(), m)));
                continue;
            }
            // The row's own cells, with `...` and `.` filled from the row before.
            let mut cells: Vec<serde_json::Value> = Vec::new();
            for (at, cell) in row.iter().enumerate() {
                match cell.as_str() {
                    Some("...") => {
                        cells.extend(before.iter().take_while(|cell| cell.is_string()).cloned())
                    }
                    Some(".") => cells.push(before[at].clone()),
                    Some(_) => cells.push(cell.clone()),
                    None => {}
                }
            }
            before = cells.clone();
            let text: Vec<String> = cells
                .iter()
                .map(|cell| cell.as_str().expect("text").to_owned())
                .collect();
            let [namespace, name, dimensions @ ..] = &text[..] else {
                panic!("a metric row of {title} without a namespace and a name: {row:?}");
            };
            let mut filters = BTreeMap::<String, BTreeSet<String>>::new();
            for pair in dimensions.chunks(2) {
                let [dimension, value] = pair else {
                    panic!("a dimension without a value in {title}: {row:?}");
                };
                filters
                    .entry(dimension.clone())
                    .or_default()
                    .insert(value.clone());
            }
            read.push((
                title.clone(),
                WidgetMetric {
                    metric: (
                        namespace.clone(),
                        name.clone(),
                        filters.keys().cloned().collect(),
                    ),
                    filters,
                },
            ));
        }
    }
    read
}

/// The metrics the `SEARCH('…', …)` calls of a metric math expression read.
fn searches(expression: &str) -> Vec<WidgetMetric> {
    let mut found = Vec::new();
    let mut rest = expression;
    while let Some(at) = rest.find("SEARCH('") {
        let query = &rest[at + "SEARCH('".len()..];
        let end = query.find('\'').expect("the search's closing quote");
        let (query, after) = (&query[..end], &query[end..]);
        rest = after;
        let schema = query
            .strip_prefix('{')
            .and_then(|schema| schema.split_once('}'))
            .expect("a search schema {namespace,dimension,…}");
        let (schema, terms) = schema;
        let mut parts = schema.split(',').map(|part| part.trim().trim_matches('"'));
        let namespace = parts.next().expect("a namespace").to_owned();
        let dimensions: BTreeSet<String> = parts.map(str::to_owned).collect();
        let mut name = None;
        let mut filters = BTreeMap::<String, BTreeSet<String>>::new();
        for term in terms.split(|c: char| c.is_whitespace() || c == '(' || c == ')') {
            let Some((key, value)) = term.split_once('=') else {
                assert!(
                    matches!(term, "" | "OR" | "AND" | "NOT"),
                    "a search term this reader does not know: {term}"
                );
                continue;
            };
            let value = value.trim_matches('"').to_owned();
            if key == "MetricName" {
                name = Some(value);
            } else {
                filters.entry(key.to_owned()).or_default().insert(value);
            }
        }
        found.push(WidgetMetric {
            metric: (
                namespace,
                name.expect("a search names its MetricName"),
                dimensions,
            ),
            filters,
        });
    }
    found
}

/// The body of the `AWS::CloudWatch::Dashboard` in `template`, its
/// `!Sub` variables given their values: the block scalar under
/// `DashboardBody: !Sub |`, read as the YAML block it is (its lines, less
/// their indentation).
pub fn dashboard_body(template: &str, variables: &[(&str, &str)]) -> serde_json::Value {
    let mut lines = template.lines();
    let key = lines
        .by_ref()
        .find(|line| line.trim() == "DashboardBody: !Sub |")
        .expect("a DashboardBody: !Sub | block");
    let indent = key.len() - key.trim_start().len();
    let block: Vec<&str> = lines
        .take_while(|line| line.trim().is_empty() || line.len() - line.trim_start().len() > indent)
        .collect();
    let mut body = block.join("\n");
    for (name, value) in variables {
        body = body.replace(&format!("${{{name}}}"), value);
    }
    assert!(
        !body.contains("${"),
        "a !Sub variable the test does not know"
    );
    serde_json::from_str(&body).expect("the dashboard body is JSON")
}

#[test]
fn the_readers_read_what_they_say() {
    let promql = PromQl::parse(
        "histogram_quantile(0.99, sum by (le, port) (rate(idempotency_x_bucket{port=~\"$port\", outcome=\"a\"}[5m]))) / sum without(job)(my_idempotency_y)",
    );
    assert_eq!(promql.selectors.len(), 1, "{promql:?}");
    assert_eq!(promql.selectors[0].0, "idempotency_x_bucket");
    assert_eq!(promql.selectors[0].1[1].value, "a");
    assert_eq!(
        promql.grouping,
        ["job", "le", "port"].map(String::from).into()
    );
    let exposition = Exposition::parse(
        "# TYPE h histogram\nh_bucket{a=\"1\",le=\"+Inf\"} 2\nh_sum{a=\"1\"} 0.5\n# TYPE c counter\nc 3\n",
    );
    assert_eq!(exposition.family("h_bucket"), Some(("h", "histogram")));
    assert_eq!(exposition.family("c"), Some(("c", "counter")));
    assert_eq!(exposition.family("c_bucket"), None);
    assert_eq!(exposition.values("h_bucket", "le"), ["+Inf"].into());
    let search = searches(
        "SUM(SEARCH('{\"N/s\",Outcome,Port} MetricName=\"A\" (Outcome=\"x\" OR Outcome=\"y\")', 'Sum', 60))",
    );
    assert_eq!(search[0].metric.0, "N/s");
    assert_eq!(
        search[0].filters["Outcome"],
        ["x", "y"].map(String::from).into()
    );
}
