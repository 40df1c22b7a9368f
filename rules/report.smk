# Tables (rebuilt from raw artifacts alone) and the report.


rule tables:
    input:
        tables_inputs,
    output:
        cells="results/tables/cells.parquet",
        requests="results/tables/requests.parquet",
        deployments="results/tables/deployments.parquet",
        gates="results/tables/gates.parquet",
    log:
        "results/logs/report/tables.log",
    benchmark:
        "results/benchmarks/report/tables.tsv"
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy tables --results results --out results/tables > {log} 2>&1"


rule build_report:
    input:
        unpack(report_inputs),
    output:
        markdown=report("results/report/report.md", caption="../report/report.rst", category="Report"),
        html="results/report/report.html",
        recommendation=report("results/report/recommendation.json", caption="../report/recommendation.rst",
                              category="Report"),
        plots=report(directory("results/report/plots"), patterns=["{name}.png"], caption="../report/plot.rst",
                     category="Plots", labels={"figure": "{name}"}),
    log:
        "results/logs/report/report.log",
    benchmark:
        "results/benchmarks/report/report.tsv"
    params:
        config=CONFIG_FILE,
        sections=" ".join(report_extension_sections()),
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy report --results results --tables results/tables --config {params.config} --out results/report "
        "--sections {params.sections} > {log} 2>&1"
